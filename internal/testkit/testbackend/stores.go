package testbackend

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/internal/testkit/testenv"
	"github.com/countlimit/countlimit/internal/testkit/testenv/redisdb"
)

// Backend is a store to run end-to-end tests on.
type Backend struct {
	Name string
	// Open returns the store, or skips t (fails it when backends are
	// required) when its server is missing. The store outlives t: open it in
	// a subtest and use it in the parent.
	Open func(t testing.TB) driver.Store
}

// Backends lists every store: memory, postgres, redis.
func Backends() []Backend {
	return []Backend{
		// No janitor: nothing to stop.
		{"memory", func(testing.TB) driver.Store { return memstore.New(memstore.WithJanitorInterval(0)) }},
		{"postgres", func(t testing.TB) driver.Store { return pgstore.New(Postgres(t)) }},
		{"redis", func(t testing.TB) driver.Store { return redisstore.New(Redis(t)) }},
	}
}

var (
	rcOnce sync.Once
	rcURL  string
	rc     *redis.Client
	rcErr  error
)

// RedisURL returns the URL of a logical database of the test Redis leased
// to this test process (see internal/testkit/testenv/redisdb), so that its tests
// never write into the database the server's URL names, nor into another
// process's: empty when leased, flushed and given back when the process's
// tests end (Main). It skips t when there is no server.
func RedisURL(t testing.TB) string {
	t.Helper()
	server := testenv.RedisURL(t)
	rcOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		l, err := redisdb.Acquire(ctx, server)
		if err != nil {
			rcErr = err
			return
		}
		atExit(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := l.Release(ctx); err != nil {
				fmt.Fprintf(os.Stderr, "testbackend: %v\n", err)
			}
		})
		rcURL, rc = l.URL(), l.Client()
		atExit(func() { rc.Close() })
		if err := rc.Ping(ctx).Err(); err != nil {
			rcErr = fmt.Errorf("Redis at %s: %w", rc.Options().Addr, err)
		}
	})
	if rcErr != nil {
		t.Fatalf("testbackend: %v", rcErr)
	}
	return rcURL
}

// Redis returns a client on RedisURL's database, shared by the process's
// tests and closed at exit.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	RedisURL(t)
	return rc
}
