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
//  2. else a container started with testcontainers-go, where a Docker engine
//     answers, of the image in COUNTLIMIT_TEST_REDIS_IMAGE (default
//     redis:7-alpine, or any image that behaves like the official one);
//  3. else the test is skipped with a message naming both variables and
//     what was tried; with COUNTLIMIT_REQUIRE_BACKENDS=1 (for CI) it fails
//     instead.
//
// Leases: the databases handed out are 1 to N-1 (N is the server's
// "databases" setting, 16 by default), except the one the URL names, which
// is left to whoever else uses the server. A lease is a key
// "redisstoretest:lease:<n>" in database 0, kept alive while the test runs
// and expiring a minute after its process dies, so parallel tests and test
// binaries sharing one server never share a database; a test waits (up to a
// minute) when all are leased. The server must be a single Redis, not a
// Cluster, which has only database 0.
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
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/internal/testenv"
)

// The environment variables the package reads (internal/testenv reads them
// for it; a test there checks the names agree).
const (
	// EnvURL names the Redis server to use instead of a container.
	EnvURL = "COUNTLIMIT_TEST_REDIS_URL"
	// EnvImage names the image of the container (default redis:7-alpine).
	EnvImage = "COUNTLIMIT_TEST_REDIS_IMAGE"
	// EnvRequire, set to 1, turns skips into failures.
	EnvRequire = "COUNTLIMIT_REQUIRE_BACKENDS"
)

// Client returns a client on a logical database leased to t, empty. When t
// ends the client is closed, the database flushed and the lease released.
// Client skips t when no server is found (see the package comment).
func Client(t testing.TB) *redis.Client {
	t.Helper()
	opts := lease(t)
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	return c
}

// URL returns the URL of a logical database leased to t, empty, for code
// under test that opens its own client. When t ends the database is flushed
// and the lease released. URL skips t when no server is found.
func URL(t testing.TB) string {
	t.Helper()
	server := testenv.RedisURL(t)
	opts := lease(t)
	u, err := url.Parse(server)
	if err != nil {
		t.Fatalf("%s: %v", EnvURL, err)
	}
	if u.Scheme == "unix" {
		q := u.Query()
		q.Set("db", strconv.Itoa(opts.DB))
		u.RawQuery = q.Encode()
	} else {
		u.Path = "/" + strconv.Itoa(opts.DB)
	}
	return u.String()
}

// Main runs the tests of a package (call it from TestMain), then removes
// the containers this package and pgstoretest started, and exits.
func Main(m *testing.M) { testenv.Main(m) }

const (
	leaseTTL  = time.Minute
	leaseWait = time.Minute
)

const leasePrefix = "redisstoretest:lease:"

func leaseKey(db int) string { return leasePrefix + strconv.Itoa(db) }

// Both act only while the lease is still the caller's (its token).
var (
	//go:embed renew.lua
	renewLua   string
	renewLease = redis.NewScript(renewLua)
	//go:embed release.lua
	releaseLua   string
	releaseLease = redis.NewScript(releaseLua)
)

// lease returns options for a database leased to t and flushed, and
// registers its release.
func lease(t testing.TB) *redis.Options {
	t.Helper()
	server := testenv.RedisURL(t)
	opts, err := redis.ParseURL(server)
	if err != nil {
		t.Fatalf("%s: %v", EnvURL, err)
	}
	opts.ContextTimeoutEnabled = true
	adminOpts := *opts
	adminOpts.DB = 0
	admin := redis.NewClient(&adminOpts)

	ctx, cancel := context.WithTimeout(context.Background(), leaseWait+10*time.Second)
	defer cancel()
	db, token, err := acquire(ctx, admin, opts.DB)
	if err != nil {
		admin.Close()
		t.Fatalf("redisstoretest: Redis at %s: %v", opts.Addr, err)
	}
	opts.DB = db
	flusher := redis.NewClient(opts)

	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(leaseTTL / 4)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = renewLease.Run(ctx, admin, []string{leaseKey(db)}, token, leaseTTL.Milliseconds()).Err()
				cancel()
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-stopped
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := flusher.FlushDB(ctx).Err(); err != nil {
			t.Errorf("redisstoretest: Redis at %s: flush database %d: %v", opts.Addr, db, err)
		}
		_ = releaseLease.Run(ctx, admin, []string{leaseKey(db)}, token).Err()
		flusher.Close()
		admin.Close()
	})
	// Whoever held the database last may have died before flushing it.
	if err := flusher.FlushDB(ctx).Err(); err != nil {
		t.Fatalf("redisstoretest: Redis at %s: flush database %d: %v", opts.Addr, db, err)
	}
	return opts
}

// acquire leases a database other than 0 and skip, waiting while all are
// leased.
func acquire(ctx context.Context, admin *redis.Client, skip int) (db int, token string, err error) {
	n := 16
	if cfg, err := admin.ConfigGet(ctx, "databases").Result(); err == nil {
		if v, err := strconv.Atoi(cfg["databases"]); err == nil {
			n = v
		}
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	token = hex.EncodeToString(b[:])
	deadline := time.Now().Add(leaseWait)
	for {
		candidates := 0
		for db := 1; db < n; db++ {
			if db == skip {
				continue
			}
			candidates++
			ok, err := admin.SetNX(ctx, leaseKey(db), token, leaseTTL).Result()
			if err != nil {
				return 0, "", err
			}
			if ok {
				return db, token, nil
			}
		}
		if candidates == 0 {
			return 0, "", fmt.Errorf("no logical database to lease: the server has %d, and 0 and %d are not handed out", n, skip)
		}
		if time.Now().After(deadline) {
			return 0, "", fmt.Errorf("all %d logical databases were leased to other tests for %v (keys %s* in database 0)", candidates, leaseWait, leasePrefix)
		}
		select {
		case <-ctx.Done():
			return 0, "", errors.Join(errors.New("waiting for a free logical database"), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
