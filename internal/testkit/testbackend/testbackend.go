// Package testbackend gives the project's tests their stores and servers.
// Finding PostgreSQL and Redis is internal/testkit/testenv's job, shared with the
// public helpers pgstore/pgstoretest and redisstore/redisstoretest:
//
//  1. the URL in COUNTLIMIT_TEST_POSTGRES_URL / COUNTLIMIT_TEST_REDIS_URL;
//  2. else a server on the default local port that lets the postgres user
//     in without a password / answers PING without one (unless
//     COUNTLIMIT_TEST_LOCAL=off);
//  3. else a testcontainers-go container of COUNTLIMIT_TEST_POSTGRES_IMAGE /
//     COUNTLIMIT_TEST_REDIS_IMAGE (default postgres:15-alpine,
//     redis:7-alpine), where a Docker engine answers;
//  4. else the test is skipped with a message saying what was tried — or
//     fails, when COUNTLIMIT_REQUIRE_BACKENDS=1 (as in CI).
//
// Each test process works in a PostgreSQL schema of its own and a Redis
// logical database of its own (RedisURL), so packages tested in parallel
// never see each other's tables or keys, and deletes only those: a
// database holding keys no test wrote is never taken (internal/testkit/testenv/
// redisdb). Call Main from TestMain so schemas, databases and containers
// are removed, flushed and given back when the tests end.
package testbackend

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/testkit/testenv"
	"github.com/countlimit/countlimit/internal/testkit/testenv/pgschema"
)

// EnvRedis names the environment variable with the Redis URL the helpers
// use, for messages.
const EnvRedis = testenv.EnvRedis

// Main runs the tests, removes what the helpers created, and exits.
func Main(m *testing.M) { testenv.Main(m) }

func atExit(f func()) { testenv.AtExit(f) }

// Unavailable skips t, or fails it when backends are required.
func Unavailable(t testing.TB, what string, why error) {
	t.Helper()
	testenv.Unavailable(t, what, why)
}

// PostgresURL returns the URL of a PostgreSQL server, or skips t.
func PostgresURL(t testing.TB) string { t.Helper(); return testenv.PostgresURL(t) }

var (
	shOnce  sync.Once
	shared  string // the schema this process's tests share
	sharedP *pgxpool.Pool
	shErr   error
)

// Postgres returns a pool on this process's own schema with countlimit's
// migrations applied. The pool is shared by the process's tests; isolate
// state with unique UseTypes or ids.
func Postgres(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := PostgresURL(t)
	shOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if shared, shErr = schemaAtExit(ctx, url); shErr != nil {
			return
		}
		if sharedP, shErr = poolAtExit(ctx, url, shared); shErr != nil {
			return
		}
		if err := pgstore.Migrate(ctx, sharedP); err != nil {
			shErr = fmt.Errorf("PostgreSQL at %s: migrate: %w", pgschema.Redact(url), err)
		}
	})
	if shErr != nil {
		t.Fatal(shErr)
	}
	return sharedP
}

// PostgresPool returns another pool on the schema Postgres uses: a second
// client to the same counters. It is closed when t ends.
func PostgresPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := pgschema.Pool(ctx, PostgresURL(t), shared)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// FreshSchema returns a pool on a new, empty schema (no migrations). The
// pool is closed when t ends, the schema dropped when the process ends.
func FreshSchema(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name, err := schemaAtExit(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pgschema.Pool(ctx, url, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// FreshSchemaURL returns a URL for a new, empty schema (no migrations),
// dropped when the test process ends: for code under test that opens its
// own connections, like the CLI.
func FreshSchemaURL(t testing.TB) string {
	t.Helper()
	url := PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name, err := schemaAtExit(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	return pgschema.URL(url, name)
}

// PoolConfig returns a pool config on the schema Postgres uses, for tests
// that need their own settings (a tracer, say).
func PoolConfig(t testing.TB) *pgxpool.Config {
	t.Helper()
	Postgres(t)
	cfg, err := pgschema.Config(PostgresURL(t), shared)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// schemaAtExit creates a schema, dropped when the process's tests end.
func schemaAtExit(ctx context.Context, url string) (string, error) {
	name, err := pgschema.Create(ctx, url)
	if err != nil {
		return "", err
	}
	atExit(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = pgschema.Drop(ctx, url, name)
	})
	return name, nil
}

// poolAtExit opens a pool on schema, closed when the process's tests end.
func poolAtExit(ctx context.Context, url, schema string) (*pgxpool.Pool, error) {
	p, err := pgschema.Pool(ctx, url, schema)
	if err != nil {
		return nil, err
	}
	atExit(p.Close)
	return p, nil
}

// Alternate returns a function that gives each test the items of xs in
// turn, starting from the second: two calls in one test get two different
// items (storetest's two clients on the same counters), whatever other
// tests running in parallel take. It is safe for concurrent use.
func Alternate[T any](xs ...T) func(*testing.T) T {
	var mu sync.Mutex
	calls := map[*testing.T]int{}
	return func(t *testing.T) T {
		mu.Lock()
		defer mu.Unlock()
		calls[t]++
		return xs[calls[t]%len(xs)]
	}
}
