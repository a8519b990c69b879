package testbackend

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/redisstore"
)

// Backend is a store to run end-to-end tests on.
type Backend struct {
	Name string
	// Open returns the store, or skips t (fails it when backends are
	// required) when its server is missing. The store outlives t: open it in
	// a subtest and use it in the parent.
	Open func(t testing.TB) countlimit.Store
}

// Backends lists every store: memory, postgres, redis.
func Backends() []Backend {
	return []Backend{
		// No janitor: nothing to stop.
		{"memory", func(testing.TB) countlimit.Store { return memstore.New(memstore.WithJanitorInterval(0)) }},
		{"postgres", func(t testing.TB) countlimit.Store { return pgstore.New(Postgres(t)) }},
		{"redis", func(t testing.TB) countlimit.Store { return redisstore.New(Redis(t)) }},
	}
}

var (
	rcOnce sync.Once
	rc     *redis.Client
	rcErr  error
)

// Redis returns a client on the test Redis, shared by the process's tests
// and closed at exit.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	url := RedisURL(t)
	rcOnce.Do(func() {
		opts, err := redis.ParseURL(url)
		if err != nil {
			rcErr = fmt.Errorf("%s: %w", EnvRedis, err)
			return
		}
		opts.ContextTimeoutEnabled = true
		rc = redis.NewClient(opts)
		atExit(func() { rc.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rcErr = rc.Ping(ctx).Err()
	})
	if rcErr != nil {
		t.Fatalf("Redis: %v", rcErr)
	}
	return rc
}
